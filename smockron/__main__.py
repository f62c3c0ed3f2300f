from smockron.cli import main

main()

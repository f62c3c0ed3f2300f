"""Drop-in replacements for two small rate-limiting daemons: JARL and DThrottle.

Each daemon is a sub-package (``jarl/``, ``dthrottle/``): a pure ``algorithm`` module plus
thin asyncio adapters (``server``; DThrottle's also ``peers``, ``report``, ``clock``) and a
click command (``cli``). See docs/daemons.md.
"""

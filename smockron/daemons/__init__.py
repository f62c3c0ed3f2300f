"""Drop-in replacements for two small rate-limiting daemons: JARL and DThrottle.

Each daemon is a pure algorithm module (``jarl``, ``dthrottle``, ``report``) plus thin
asyncio adapters (``jarl_server``, ``dthrottle_server``, ``peers``) and a click command
(``jarl_cli``, ``dthrottle_cli``). See docs/daemons.md.
"""

"""Pure parsers: text in, frozen values out.

Nothing here reads a file, imports Kubernetes or NVML, or knows about the agent: every function
takes the text it is handed and returns typed values or raises `ParseError`.
"""

from parsers.errors import ParseError

__all__ = ["ParseError"]

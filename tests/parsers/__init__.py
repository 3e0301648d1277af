"""The pure parsers: text in, frozen values or ParseError out."""

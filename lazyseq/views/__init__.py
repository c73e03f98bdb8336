"""Lazy, random-access views: the base class and one module per combinator."""

"""Dialect descriptions: markers, a block parser for the argument syntax, an opener builder."""

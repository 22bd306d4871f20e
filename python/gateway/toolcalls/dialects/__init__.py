"""Dialect descriptions: the block marker and a block parser for the argument syntax."""

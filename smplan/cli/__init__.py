"""The click command line. Commands parse, call one library function, and print."""

from .main import main

__all__ = ["main"]

from .reader import column, read_rows
from .summary import numeric_summary

__all__ = ["read_rows", "column", "numeric_summary"]

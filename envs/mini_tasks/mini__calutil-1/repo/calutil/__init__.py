from .months import add_months, end_of_month, months_between, quarter_of

__all__ = ["add_months", "end_of_month", "months_between", "quarter_of"]

"""Read CSV files as lists of dicts."""
import csv


def read_rows(path, delimiter=","):
    """Read the CSV file *path* (UTF-8, first line is the header).

    Header names and values are stripped of surrounding whitespace.  Blank
    lines are skipped.
    """
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        return [
            {key.strip(): (value or "").strip() for key, value in row.items()}
            for row in reader
        ]


def column(rows, name):
    """Return the values of column *name*."""
    return [row[name] for row in rows]

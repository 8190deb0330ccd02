# Lets pytest import the package from the repository root.

"""calc: adds and multiplies numbers from the command line."""

"""Reading data from files into views."""

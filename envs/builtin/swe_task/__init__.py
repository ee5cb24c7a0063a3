"""Built-in `swe-task`: bugs injected into real PyPI projects, graded by hidden tests."""

"""Fixtures shared by every test folder; helpers live in tests/support.py."""

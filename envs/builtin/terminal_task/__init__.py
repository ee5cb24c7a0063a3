"""Built-in `terminal-task`: Harbor-format task folders (file and text processing, data
wrangling, a service to fix, a failing build), each with an oracle solution and tests."""

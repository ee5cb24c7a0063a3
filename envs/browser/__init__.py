"""Chromium through Playwright for browser environments: finding the browser, launching it
offline, and the Playwright runtime staged into sandboxes (`envhub[browser]`)."""

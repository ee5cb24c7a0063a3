"""Building the offline SWE task set from real PyPI projects (SWE-smith style).

sdist (pinned, sha256-checked) → snapshot of package + tests → AST bug injection in code the
tests cover → F2P/P2P recorded by running the tests → issue text from the failures →
validation through the real grader (gold 3/3 resolved, empty patch 0/3). Entry point:
`scripts/build_swe_tasks.py`; configuration: `projects.toml` beside this file.
"""

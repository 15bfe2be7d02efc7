"""`samebits lint samebits/` passes on our own code: every deliberate atomic states why, in the file."""
from pathlib import Path

import samebits
from samebits.lint.cli import lint

PACKAGE = Path(samebits.__file__).parent


def test_our_code_has_no_finding():
    findings, notes = lint([PACKAGE])
    assert not notes, notes
    assert not findings, sorted(f"{f.path}:{f.line}: {f.rule} {f.message}" for f in findings)


def test_a_removed_statement_is_caught(tmp_path):
    """Negative control: the demo's atomic without its reasoned comment is a finding."""
    demo = PACKAGE / "kernels" / "demos" / "splitk_atomic.py"
    bare = "\n".join(line for line in demo.read_text().splitlines() if "samebits:" not in line)
    (tmp_path / "demo.py").write_text(bare)
    findings, _ = lint([tmp_path])
    assert [f.rule for f in findings] == ["SB201"]

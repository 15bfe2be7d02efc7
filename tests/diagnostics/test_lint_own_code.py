"""`samebits lint samebits/` passes on our own code.

ALLOWED lists the findings whose reasoned comment is still to be added in a file that is being moved right now; each
entry names the comment. Once the comments are in, ALLOWED is empty and the second test keeps it so.
"""
from pathlib import Path

import pytest

import samebits
from samebits.diagnostics.lint.cli import lint

PACKAGE = Path(samebits.__file__).parent

# (file name, rule, the line's code) -> the statement to add above that line.
ALLOWED = {
    ("splitk_atomic_demo.py", "SB201",
     "tl.atomic_add(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))"):
        "# samebits: intentionally nondeterministic because this is the seed's 2.2 bug, shown by the probe only",
    ("probes.py", "SB301",
     "ms, runs_differ = repeat_runs(lambda: torch.zeros(s.index_add_bins, device=ctx.device).index_add_(0, idx, src),"):
        "# samebits: intentionally nondeterministic because the vendor column measures index_add_'s atomics",
}


@pytest.fixture(scope="module")
def found():
    findings, notes = lint([PACKAGE])
    assert not notes, notes
    return {(Path(f.path).name, f.rule, Path(f.path).read_text().splitlines()[f.line - 1].strip()): f
            for f in findings}


def test_our_code_has_no_finding_outside_the_allow_list(found):
    unexpected = {f"{f.path}:{f.line}: {f.rule} {f.message}" for key, f in found.items() if key not in ALLOWED}
    assert not unexpected, sorted(unexpected)


def test_allow_list_has_no_stale_entries(found):
    stale = set(ALLOWED) - set(found)
    assert not stale, f"the comment is in (or the code moved): remove from ALLOWED {sorted(stale)}"

"""Suppression: only a comment that states the guarantee silences, next to the code; a bare marker is a finding."""
from samebits.lint.cuda_checker import check_cuda
from samebits.lint.python_checker import check_python
from samebits.lint.suppress import is_statement

PY = "def f(x, i, s):\n    {above}\n    x.index_add_(0, i, s){inline}\n"
CU = "__global__ void k(float* out) {{\n    {above}\n    atomicAdd(&out[0], 1.0f);{inline}\n}}\n"


def rules(findings):
    return sorted(f.rule for f in findings)


def py(above="", inline=""):
    return rules(check_python("t.py", PY.format(above=above or "pass", inline=inline)))


def cu(above="", inline=""):
    return rules(check_cuda("t.cu", CU.format(above=above, inline=inline)))


def test_unsuppressed_findings():
    assert py() == ["SB301"]
    assert cu() == ["SB101"]


def test_reasoned_comment_on_the_line_or_above_silences():
    reason = "samebits: deterministic because this runs on the CPU only"
    assert py(inline=f"  # {reason}") == []
    assert py(above=f"# {reason}") == []
    assert cu(inline=f"  // {reason}") == []
    assert cu(above=f"/* {reason} */") == []


def test_intentional_nondeterminism_is_a_statement_too():
    assert py(above="# samebits: intentionally nondeterministic because the probe demonstrates the bug") == []


def test_bare_marker_does_not_silence_and_is_reported():
    for bare in ("samebits: deterministic", "samebits: deterministic because", "samebits: ok",
                 "samebits: deterministic because trust me"):
        assert py(inline=f"  # {bare}") == ["SB001", "SB301"], bare
        assert cu(inline=f"  // {bare}") == ["SB001", "SB101"], bare


def test_reason_needs_three_words_and_ends_at_a_second_comment():
    assert is_statement("# samebits: deterministic because one writer per element")
    assert not is_statement("# samebits: deterministic because reviewed")
    assert not is_statement("# samebits: deterministic because  # TODO later")
    assert not is_statement("x = 1")


def test_marker_in_a_string_is_not_a_comment():
    src = 'def f(x, i, s):\n    x.index_add_(0, i, s); note = "# samebits: deterministic because it is fine here"\n'
    assert rules(check_python("t.py", src)) == ["SB301"]
    src = '__global__ void k(float* o) {\n    atomicAdd(o, 1.0f); auto s = "// samebits: deterministic because ok ok ok";\n}\n'
    assert rules(check_cuda("t.cu", src)) == ["SB101"]


def test_statement_reaches_the_line_after_a_comment_block_only():
    block = "# samebits: deterministic because the indices are unique\n    # (checked by the caller)"
    assert py(above=block) == []
    gap = "# samebits: deterministic because the indices are unique\n"
    assert py(above=gap) == ["SB301"]  # a blank line between comment and code breaks the link


def test_statement_on_any_line_of_a_multiline_call_silences():
    src = "def f(x, i, s):\n    x.index_add_(0, i,\n                 s)  # samebits: deterministic because CPU only here\n"
    assert rules(check_python("t.py", src)) == []

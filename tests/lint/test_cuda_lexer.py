"""The CUDA tokenizer: comments and string literals are tokens of their own, line numbers survive them."""
from samebits.lint.cuda_lexer import code, comments, tokenize


def test_comments_and_strings_are_not_code():
    src = 'int a; // atomicAdd(x, 1.0f)\n/* atomicAdd(\n y) */ auto s = "atomicAdd(\\"x\\")"; auto r = R"d(atomicAdd)d";\n'
    idents = [t.text for t in code(tokenize(src)) if t.kind == "ident"]
    assert "atomicAdd" not in idents and idents == ["int", "a", "auto", "s", "auto", "r"]


def test_lines_and_columns_count_through_multiline_tokens():
    toks = code(tokenize('/* one\n two */ x = "a";\n  k<<<g, b>>>(p);\n'))
    x = next(t for t in toks if t.text == "x")
    assert (x.line, x.col) == (2, 9)
    launch = next(t for t in toks if t.text == "<<<")
    assert (launch.line, launch.col) == (3, 4)
    assert ">>>" in [t.text for t in toks]


def test_comment_alone_on_its_line_or_after_code():
    cs = comments(tokenize("x = 1; // after\n    // alone\n"))
    assert [(c.line, c.alone) for c in cs] == [(1, False), (2, True)]


def test_numbers_keep_suffixes_and_exponents():
    nums = [t.text for t in tokenize("1.0f 2.5e-3 0x1fULL 1'000 .5") if t.kind == "number"]
    assert nums == ["1.0f", "2.5e-3", "0x1fULL", "1'000", ".5"]

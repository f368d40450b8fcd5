"""tests/filecheck.py: each directive accepts what it should and rejects what it should, with a useful message."""
from __future__ import annotations

import pytest

from filecheck import FileCheckError, check, compile_pattern

INPUT = """\
func @first(%arg0: i32)
  %0 = "mt.add"(%arg0, %arg0) : (i32, i32) -> i32
  %1 = "mt.mul"(%0, %0) : (i32, i32) -> i32
  "mt.store"(%1)
func @second(%arg1: f32)
  %2 = "mt.exp"(%arg1) : (f32) -> f32
  "mt.store"(%2)
"""


def checks(*lines: str) -> str:
    return "\n".join(f"// {line}" for line in lines)


def fails(check_text: str, *fragments: str) -> str:
    with pytest.raises(FileCheckError) as info:
        check(INPUT, check_text, name="t.mtir")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    return message


def test_plain_next_same_and_captures_pass() -> None:
    check(INPUT, checks(
        'CHECK: [[A:%[0-9]+]] = "mt.add"(%arg0, %arg0)',
        'CHECK-NEXT: [[M:%[0-9]+]] = "mt.mul"([[A]], [[A]])',
        'CHECK-SAME: -> i32',
        'CHECK-NEXT: "mt.store"([[M]])',
        'CHECK: "mt.exp"({{%arg[0-9]}})',
    ))


def test_whitespace_runs_match_any_run() -> None:
    check(INPUT, checks('CHECK: %0   =  "mt.add"'))


def test_not_dag_and_label_pass() -> None:
    check(INPUT, checks(
        "CHECK-LABEL: @first",
        'CHECK-DAG: "mt.mul"',
        'CHECK-DAG: "mt.add"',
        'CHECK-NOT: "mt.exp"',
        "CHECK-LABEL: @second",
        'CHECK-NOT: "mt.add"',
        'CHECK: "mt.exp"',
    ))


def test_missing_pattern_fails_with_location_and_input() -> None:
    message = fails(checks('CHECK: "mt.add"', 'CHECK: "mt.sub"'), 't.mtir:2: CHECK: "mt.sub"',
                    "expected pattern not found", "at input line 2", '   3    %1 = "mt.mul"')
    assert "input:" in message


def test_order_matters_for_plain_checks() -> None:
    fails(checks('CHECK: "mt.mul"', 'CHECK: "mt.add"'), 'CHECK: "mt.add"', "not found")


def test_next_on_a_later_line_fails() -> None:
    fails(checks('CHECK: "mt.add"', 'CHECK-NEXT: "mt.store"'), "CHECK-NEXT", "matched on line 4",
          "not on the line after the previous match (line 2)")


def test_same_on_another_line_fails() -> None:
    fails(checks('CHECK: "mt.add"', 'CHECK-SAME: "mt.mul"'), "CHECK-SAME", "matched on line 3")


def test_not_found_between_matches_fails() -> None:
    fails(checks('CHECK: @first', 'CHECK-NOT: "mt.mul"', 'CHECK: "mt.store"'), 't.mtir:2: CHECK-NOT',
          "excluded pattern found: '\"mt.mul\"'", "at input line 3")


def test_not_only_looks_between_its_neighbours() -> None:
    check(INPUT, checks('CHECK: "mt.mul"', 'CHECK-NOT: "mt.add"', 'CHECK: "mt.exp"'))


def test_trailing_not_covers_the_rest() -> None:
    fails(checks('CHECK: @first', 'CHECK-NOT: "mt.exp"'), "excluded pattern found", "at input line 6")


def test_captured_value_must_repeat() -> None:
    fails(checks('CHECK: [[A:%[0-9]+]] = "mt.add"', 'CHECK: "mt.store"([[A]])'), 'CHECK: "mt.store"([[A]])')


def test_capture_used_twice_in_one_pattern_is_a_backreference() -> None:
    check(INPUT, checks('CHECK: "mt.add"([[X:%arg[0-9]+]], [[X]])'))
    fails(checks('CHECK: "mt.mul"([[X:%[0-9]+]], [[X]]) : (i32, f32)'), "not found")


def test_dag_matches_may_not_overlap() -> None:
    check(INPUT, checks('CHECK-DAG: "mt.store"', 'CHECK-DAG: "mt.store"'))
    fails(checks('CHECK-DAG: "mt.mul"', 'CHECK-DAG: "mt.mul"'), "CHECK-DAG", "not found")


def test_label_confines_checks_to_its_section() -> None:
    fails(checks("CHECK-LABEL: @first", 'CHECK: "mt.exp"', "CHECK-LABEL: @second"), 'CHECK: "mt.exp"')
    fails(checks("CHECK-LABEL: @third"), "CHECK-LABEL: @third", "label not found")


def test_malformed_checks_are_errors() -> None:
    fails(checks('CHECK-NXT: "mt.add"'), "unknown directive CHECK-NXT:")
    fails(checks("CHECK:   "), "empty pattern")
    fails(checks("CHECK: [[UNSET]]"), "[[UNSET]] is used before it is defined")
    fails(checks("CHECK: {{[0-9}}"), "bad regex")
    fails("// no directives here", "no CHECK directives found")


def test_regex_blocks_may_hold_braces_and_brackets() -> None:
    assert compile_pattern("a{{[0-9]{2}}}b", {}).fullmatch("a42b")
    assert compile_pattern("[[N:[a-z]+]]-[[N]]", {}).fullmatch("ab-ab")
    assert not compile_pattern("[[N:[a-z]+]]-[[N]]", {}).fullmatch("ab-cd")
    assert compile_pattern("x.y(z)", {}).fullmatch("x.y(z)")  # literal text is not a regex
    assert not compile_pattern("x.y", {}).fullmatch("xzy")


def test_line_offset_places_directives_in_their_file() -> None:
    with pytest.raises(FileCheckError, match=r"f\.mtir:12: CHECK: nowhere"):
        check(INPUT, "x\n// CHECK: nowhere", name="f.mtir", line_offset=10)

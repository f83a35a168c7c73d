"""How an exec's argv is masked before its event is written (end to end, on Docker:
tests/events/test_event_masking.py)."""

import re

from sandboxer.core.store.events import mask_argv


def test_values_are_masked_inside_any_element_longest_first():
    argv = ["curl", "-H", "Authorization: Bearer abc123def", "--data=abc123", "abc"]
    assert mask_argv(argv, ["abc123", "abc123def"]) == [
        "curl", "-H", "Authorization: Bearer ***", "--data=***", "abc"]


def test_empty_values_mask_nothing_and_patterns_mask_their_matches():
    argv = ["sh", "-c", "git clone https://ghp_aaa111@host/x && echo ghp_bbb222"]
    assert mask_argv(argv, ["", ""], [re.compile(r"ghp_[a-z0-9]+")]) == [
        "sh", "-c", "git clone https://***@host/x && echo ***"]


def test_a_value_with_regex_characters_is_masked_literally():
    assert mask_argv(["a.b*c", "axbbc"], ["a.b*c"]) == ["***", "axbbc"]

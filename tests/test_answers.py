import pytest

from reasonrl.answers import parse_integer


@pytest.mark.parametrize(
    "text,value",
    [
        ("025", 25), ("3,000", 3000), ("$540$", 540), ("540 dollars", 540), ("27.0", 27), ("-3", -3),
        ("\\boxed{12}", 12), ("90^\\circ", 90), ("12\\%", 12), ("1{,}000", 1000), ("\\$540", 540),
        ("11,\\! 111,\\! 111,\\! 100", 11111111100), ("12 cm", 12), ("5\\text{ cm}", 5), (7, 7), (3.0, 3),
        ("10 square feet", 10), ("12 miles per hour", 12), ("864 \\mbox{ inches}^2", 864), ("30 Degrees", 30), ("7 hrs.", 7),
        ("90^{\\circ}", 90), ("90^{ \\circ }", 90), ("90°", 90),
    ],
)
def test_integers(text, value):
    assert parse_integer(text) == value


@pytest.mark.parametrize(
    "text",
    ["1/2", "2.5", "x=3", "3pi", "2i", "5x", "2e", "1 million", "2 thousand", "2k", "3 n", "5\\text{ pi}", "(1,2)", "", None, 2.5, True,
     # units are a closed list: trailing words are not units
     "42 and above", "3 or more", "42 apples", "5 \\text{or so}", "12 cm and more",
     # a degree mark is whole or it is not one
     "90^{\\circ", "90^\\circ}"],
)
def test_not_integers(text):
    assert parse_integer(text) is None

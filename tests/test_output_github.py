"""GitHub Actions annotations and the toolkit's escaping rules."""

from __future__ import annotations

import io
import re

from hypothesis import given, strategies as st

from fsdplint.findings import Finding, Position, Severity
from fsdplint.output import write_report
from fsdplint.output.github import escape_data, escape_property, unescape_data, unescape_property


def finding(**kw):
    base = dict(code="FSDP101", name="lora-after-fsdp-wrap", severity=Severity.ERROR, filename="src/train.py",
                start=Position(12, 5), end=Position(12, 30), message="LoRA injected after wrap")
    base.update(kw)
    return Finding(**base)


def render(findings):
    buf = io.StringIO()
    write_report(findings, "github", buf)
    return buf.getvalue()


def test_annotation_shape():
    assert render([finding()]) == (
        "::error file=src/train.py,line=12,col=5,endLine=12,endColumn=30,"
        "title=fsdplint (FSDP101)::LoRA injected after wrap\n"
    )


def test_dot_slash_prefix_is_dropped():
    assert render([finding(filename="./src/train.py")]).startswith("::error file=src/train.py,")


def test_severity_maps_to_command():
    out = render([finding(severity=Severity.WARNING), finding(severity=Severity.INFO, start=Position(13, 1))])
    assert [ln.split(" ", 1)[0] for ln in out.splitlines()] == ["::warning", "::notice"]


def test_toolkit_escaping():
    assert escape_data("100%\r\nnext") == "100%25%0D%0Anext"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    out = render([finding(filename="dir,x/a:b.py", message="50% done\nsecond line")])
    assert "file=dir%2Cx/a%3Ab.py," in out
    assert out.endswith("::50% done\nsecond line".replace("%", "%25").replace("\n", "%0A") + "\n")
    assert out.count("\n") == 1


_COMMAND = re.compile(r"^::(error|warning|notice) (?P<props>[^:]*)::(?P<data>.*)$")


@given(filename=st.text(min_size=1, max_size=30).filter(lambda s: not s.startswith("./")), message=st.text(max_size=60))
def test_escaping_round_trips(filename, message):
    """Whatever the path and message, one command line that parses back to the original."""
    out = render([finding(filename=filename, message=message)])
    assert out.endswith("\n") and out.count("\n") == 1
    m = _COMMAND.match(out[:-1])
    assert m, out
    props = dict(p.split("=", 1) for p in m.group("props").split(","))
    assert unescape_property(props["file"]) == filename
    assert unescape_property(props["title"]) == "fsdplint (FSDP101)"
    assert unescape_data(m.group("data")) == message

"""JUnit XML: one test case per finding, grouped into one test suite per file.

Jenkins, GitLab and Azure Pipelines show these as failed tests.
"""

from __future__ import annotations

from collections import defaultdict
from xml.etree import ElementTree as ET


def write(findings, out, *, summary=None, **_options) -> None:
    by_file = defaultdict(list)
    for f in findings:
        by_file[f.filename].append(f)
    root = ET.Element("testsuites", name="fsdplint", tests=str(len(findings)), failures=str(len(findings)))
    if not findings:
        suite = ET.SubElement(root, "testsuite", name="fsdplint", tests="1", failures="0", errors="0", skipped="0")
        ET.SubElement(suite, "testcase", name="fsdplint", classname="fsdplint")
        root.set("tests", "1")
    for filename, items in by_file.items():
        suite = ET.SubElement(
            root, "testsuite", name=filename, tests=str(len(items)), failures=str(len(items)), errors="0", skipped="0"
        )
        for f in items:
            case = ET.SubElement(
                suite,
                "testcase",
                name=f"{f.code} {f.name} at {f.filename}:{f.start.row}:{f.start.column}",
                classname=f.filename,
                file=f.filename,
                line=str(f.start.row),
            )
            failure = ET.SubElement(case, "failure", message=f.message, type=f.code)
            failure.text = (
                f"{f.filename}:{f.start.row}:{f.start.column}: {f.code} [{f.severity.value}] {f.message}\n"
                + "".join(f"  {r.text()}\n" for r in f.related)
                + f"see {f.url}"
            )
    ET.indent(root)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")

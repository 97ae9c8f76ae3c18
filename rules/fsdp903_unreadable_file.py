from fsdplint.findings import Severity
from fsdplint.rule import Rule


class UnreadableFile(Rule):
    code = "FSDP903"
    name = "unreadable-file"
    severity = Severity.ERROR
    summary = "The file cannot be read or decoded (permissions, encoding, a configuration error)."
    doc = """
    ## What it does
    Reports a file fsdplint could not read: no permission, not decodable in its declared encoding
    (UTF-8 by default), or a broken configuration that applies to it.

    ## Why is this bad?
    fsdplint could not check the file at all.

    ## Example
    A Latin-1 file without a `# -*- coding: latin-1 -*-` cookie.

    ## Use instead
    Save the file as UTF-8 or declare its encoding; make it readable.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - PEP 263 (source file encodings)
    """

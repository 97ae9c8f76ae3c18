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
    (UTF-8 by default), or a broken configuration that applies to it. A file that is not text says what it
    is instead: UTF-16/UTF-32 text (with or without a byte-order mark), or binary data — a ZIP archive (a
    `torch.save` checkpoint, a wheel), a pickle, a safetensors file, an image or an executable.

    ## Why is this bad?
    fsdplint could not check the file at all.

    ## Example
    A Latin-1 file without a `# -*- coding: latin-1 -*-` cookie; a script saved as UTF-16 by an editor; a
    checkpoint named `train.py`.

    ## Use instead
    Save the file as UTF-8 or declare its encoding; make it readable; keep binary files out of the linted
    paths (`exclude` in `[tool.fsdplint]`).

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - PEP 263 (source file encodings)
    """

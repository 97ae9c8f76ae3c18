"""How a rule that claims an absence names the calls whose code was not read (ScriptAnalysis.unseen)."""


def unread_names(ctx, unseen, limit: int = 3) -> str:
    """`what (line N)` for the first `limit` unread calls, joined for a message."""
    return "; ".join(f"{what} (line {ctx.line(call.node)})" for call, what in unseen[:limit])

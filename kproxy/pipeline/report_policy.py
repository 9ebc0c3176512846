"""The report's policy section: who breaks the rules of the file given with ``--policy``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .report_cells import Col, _esc, _int, _list, _sorted, _when

if TYPE_CHECKING:                   # the report calls this section, handing it its data
    from .report import _Data

TABLE = "policy_violations"


def _example(row: dict) -> str:
    return (f'{_esc(row.get("example_api"))} v{_esc(row.get("example_api_version"))} from '
            f'{_esc(row.get("example_client"))}: {_esc(row.get("example_reason"))}')


def policy_section(data: _Data) -> str:
    """The section (a note that no rules file was given, without ``--policy``)."""
    policy = data.summary.get("policy")
    intro = ('<p class="question">Who would break if these rules were enforced? Each request in the '
             "capture judged by the rules file, as kproxy judges it live (<code>kproxy_policy_"
             "violations_total</code>); rules marked enforce were refused by kproxy where it enforced "
             "them.</p>")
    if policy is None:
        return (f'<section id="policy"><h2>Policy</h2>{intro}<p class="empty">No rules file given '
                "(<code>kproxy analyze --policy FILE</code>).</p></section>")
    rows = _sorted(data.rows(TABLE), "violations", reverse=True)
    notes = [f'Rules file <code>{_esc(policy["file"])}</code>: {_list(policy["rules"])}.']
    if policy.get("not_judged"):
        notes.append("Not judged on this capture (Parquet keeps no request bodies; capture JSONL for "
                     f"them): {_list(policy['not_judged'])}.")
    cols = (Col("rule", "rule", css="k"), Col("client id", "client_id", css="name"),
            Col("software", "client_software", css="k"), Col("violations", "violations", _int, True),
            Col("first seen", "first_time", _when), Col("last seen", "last_time", _when),
            Col("example", _example), Col("enforced", lambda r: "yes" if r.get("enforced") else "dry run"))
    verdict = (f'<p class="verdict bad"><strong>{_int(policy.get("violations", 0))} requests</strong> '
               f"broke a rule:</p>" if rows else
               '<p class="verdict ok"><strong>None.</strong> No request broke a rule.</p>')
    body = "".join(f"<p>{n}</p>" for n in notes) + verdict + (data.table(TABLE, rows, cols, "") if rows else "")
    return f'<section id="policy"><h2>Policy</h2>{intro}{body}</section>'

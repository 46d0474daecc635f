"""The XID -> action table against NVIDIA's Xid catalog.

https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column "Resolution Bucket
(Immediate Action)", as NVIDIA's NVSentinel ships it (distros/kubernetes/nvsentinel/charts/
gpu-health-monitor/xiderrorsmapping.csv), rows quoted verbatim:

    13,ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY,RESTART_APP,NONFATAL
    31,ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT,RESTART_APP,NONFATAL
    43,ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR,IGNORE,NONFATAL
    45,ROBUST_CHANNEL_PREEMPTIVE_REMOVAL,WORKFLOW_XID_45,NONFATAL
    48,ROBUST_CHANNEL_GPU_ECC_DBE,WORKFLOW_XID_48,FATAL
    61,PMU_BREAKPOINT,UNEXPECTED_ERR_REPORT_ISSUE,FATAL
    62,PMU_HALT_ERROR,RESET_GPU,FATAL
    63,INFOROM_DRAM_RETIREMENT_EVENT,IGNORE,NONFATAL
    64,INFOROM_DRAM_RETIREMENT_FAILURE,RESET_GPU,FATAL
    74,NVLINK_ERROR,WORKFLOW_NVLINK_ERR,FATAL
    79,ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,RESTART_BM,FATAL
    92,EXCESSIVE_SBE_INTERRUPTS,IGNORE,NONFATAL
    94,ROBUST_CHANNEL_CONTAINED_ERROR,RESTART_APP,NONFATAL
    95,ROBUST_CHANNEL_UNCONTAINED_ERROR,RESET_GPU,FATAL
    119,GSP_RPC_TIMEOUT,RESET_GPU,FATAL
    120,GSP_ERROR,RESET_GPU,FATAL
    140,UNRECOVERABLE_ECC_ERROR_ESCAPE,RESET_GPU,FATAL
"""
from __future__ import annotations

import json
import re

import pytest

from workloads.monitoring.alerts import FATAL_XIDS
from workloads.xid import XID_ACTIONS, XID_TABLE_FILE, actionable_xids, load_xid_table

CATALOG = {int(code): (mnemonic, action) for code, mnemonic, action in
           re.findall(r"^\s{4}(\d+),(.+?),([A-Z_0-9]+),(?:NON)?FATAL$", __doc__, flags=re.M)}
ISSUE_CODES = {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}


def test_every_code_the_issue_names_is_in_the_table_with_the_catalog_action():
    assert len(CATALOG) == 17
    assert ISSUE_CODES <= set(XID_ACTIONS)
    for code, (mnemonic, action) in CATALOG.items():
        row = XID_ACTIONS[code]
        assert (row.mnemonic, row.nvidia_immediate_action) == (mnemonic, action), code


@pytest.mark.parametrize("catalog_action, ours", [
    ("RESTART_APP", {"none"}), ("IGNORE", {"none"}), ("RESET_GPU", {"reset"}), ("RESTART_BM", {"replace"}),
    ("UNEXPECTED_ERR_REPORT_ISSUE", {"replace"}),
])
def test_our_action_follows_the_catalog_bucket(catalog_action, ours):
    rows = [r for r in XID_ACTIONS.values() if r.nvidia_immediate_action == catalog_action]
    assert rows and {r.action for r in rows} == ours


def test_the_alert_pages_on_exactly_the_codes_that_take_a_node_out():
    assert FATAL_XIDS == actionable_xids() == tuple(sorted(c for c, r in XID_ACTIONS.items() if r.action != "none"))
    assert 79 in FATAL_XIDS and 13 not in FATAL_XIDS


def test_a_bad_action_in_the_data_is_refused_with_the_field(tmp_path):
    data = json.loads(open(XID_TABLE_FILE, encoding="utf-8").read())
    data["xids"]["79"]["action"] = "reboot"
    data["xids"]["13"]["action"] = "restart"
    path = tmp_path / "xid.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_xid_table(str(path))
    assert "xids.79.action: 'reboot' is not one of none, drain, reset, replace" in str(info.value)
    assert "xids.13.action: 'restart'" in str(info.value)

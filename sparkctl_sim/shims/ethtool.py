"""``ethtool IFACE`` for a CX-7 twin netdev (link modes, speed, link state)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl_sim.shims.common import BDF_OF_NETDEV, Netdevs, State, ToolResult, _result

# --------------------------------------------------------------------------
# ethtool, lspci
# --------------------------------------------------------------------------

CX7_LINK_MODES = (  # in ethtool link-mode bit order
    "1000baseKX/Full",
    "10000baseKR/Full",
    "40000baseKR4/Full",
    "40000baseCR4/Full",
    "40000baseSR4/Full",
    "40000baseLR4/Full",
    "25000baseCR/Full",
    "25000baseKR/Full",
    "25000baseSR/Full",
    "50000baseCR2/Full",
    "50000baseKR2/Full",
    "100000baseKR4/Full",
    "100000baseSR4/Full",
    "100000baseCR4/Full",
    "100000baseLR4_ER4/Full",
    "50000baseKR/Full",
    "50000baseSR/Full",
    "50000baseCR/Full",
    "50000baseLR_ER_FR/Full",
    "50000baseDR/Full",
    "100000baseKR2/Full",
    "100000baseSR2/Full",
    "100000baseCR2/Full",
    "100000baseLR2_ER2_FR2/Full",
    "100000baseDR2/Full",
    "200000baseKR4/Full",
    "200000baseSR4/Full",
    "200000baseLR4_ER4_FR4/Full",
    "200000baseDR4/Full",
    "200000baseCR4/Full",
)


def _modes(prefix: str, modes: Sequence[str]) -> list[str]:
    pad = " " * len(prefix)
    return [f"\t{prefix}{modes[0]}"] + [f"\t{pad}{m}" for m in modes[1:]]


def ethtool(state: State, args: Sequence[str], netdevs: Netdevs, *, euid: int) -> ToolResult:
    """``ethtool IFACE`` (full settings) and ``ethtool -i IFACE`` (§3.1)."""
    if not args:
        return _result("", "ethtool: bad command line argument(s)\nFor more information run ethtool -h\n", 1)
    if args[0] in ("-i", "--driver") and len(args) == 2:
        iface = args[1]
        if iface not in BDF_OF_NETDEV:
            return _result("", "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n", 1)
        return _result(
            "driver: mlx5_core\n"
            f"version: {state['kernel_release']}\n"
            "firmware-version: 28.45.4028 (NVD0000000087)\n"
            "expansion-rom-version: \n"
            f"bus-info: {BDF_OF_NETDEV[iface]}\n"
            "supports-statistics: yes\n"
            "supports-test: yes\n"
            "supports-eeprom-access: no\n"
            "supports-register-dump: no\n"
            "supports-priv-flags: yes\n"
        )
    if len(args) != 1 or args[0].startswith("-"):
        return ToolResult("", "", 0, exec_argv=("ethtool", *args))
    iface = args[0]
    facts = netdevs.get(iface)
    if facts is None and iface not in BDF_OF_NETDEV:
        return _result("", "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n", 1)
    up = facts is not None and facts.link_up
    link = state["links"].get(iface, {})
    L = [f"Settings for {iface}:", "\tSupported ports: [ Backplane ]"]
    L += _modes("Supported link modes:   ", CX7_LINK_MODES)
    L += [
        "\tSupported pause frame use: Symmetric",
        "\tSupports auto-negotiation: Yes",
        "\tSupported FEC modes: None\t RS\t BASER",
    ]
    L += _modes("Advertised link modes:  ", CX7_LINK_MODES)
    L += [
        "\tAdvertised pause frame use: Symmetric",
        "\tAdvertised auto-negotiation: Yes",
        "\tAdvertised FEC modes: RS",
    ]
    if up:
        L += [f"\tSpeed: {int(link.get('speed_mbps', 200000))}Mb/s", "\tLanes: 4", "\tDuplex: Full"]
    else:
        L += ["\tSpeed: Unknown!", "\tDuplex: Unknown! (255)"]
    L += ["\tAuto-negotiation: on", "\tPort: Direct Attach Copper", "\tPHYAD: 0", "\tTransceiver: internal"]
    err = ""
    if euid == 0:
        L += ["\tSupports Wake-on: d", "\tWake-on: d"]
    else:
        err = "netlink error: Operation not permitted\n"  # WOL_GET needs CAP_NET_ADMIN
    L += ["\tCurrent message level: 0x00000004 (4)", "\t\t\t       link"]
    L.append(f"\tLink detected: {'yes' if up else 'no'}")
    return _result("\n".join(L) + "\n", err)



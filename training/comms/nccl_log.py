"""Did NCCL use EFA? Read from its init log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET), with the cause when not.

The lines looked for, as NCCL and the aws-ofi-nccl plugin print them:
- NCCL src/init.cc: "Using network <name>"; the plugin's name is "Libfabric" (aws-ofi-nccl
  src/nccl_ofi_interface_nvidia.cpp; "AWS Libfabric" up to plugin 1.11), the built-in fallback is "Socket"
  (src/transport/net_socket.cc).
- aws-ofi-nccl src/nccl_ofi_net.cpp: "NET/OFI Selected provider is efa, fabric is ... (found N nics)" (older
  plugins: "Selected Provider is efa (found N nics)").
- the causes of a fallback seen in the field: no EFA device in the pod ("NET/OFI No eligible providers were
  found", "fi_getinfo() call failed": aws-ofi-nccl#1020, aws-samples/aws-do-eks#54), no plugin on the loader
  path ("NET/Plugin: Could not find: libnccl-net.so", older "No plugin found (libnccl-net.so)": NVIDIA/nccl#1504,
  #352), and the socket transport bound to EKS Pod Identity's link (aws-samples/aws-do-eks#54).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NETWORK = re.compile(r"Using network (AWS Libfabric|Libfabric|OFI|Socket|IB)\b")
EFA_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is efa\b")
SOCKET_IFS = re.compile(r"NET/Socket : Using (.*)")

CAUSES = (
    (
        re.compile(r"NET/OFI (No eligible providers were found|OFI fi_getinfo\(\) call failed)"),
        "libfabric found no EFA device in the pod: request vpc.amazonaws.com/efa like the training jobs do (and run "
        "on an instance type with EFA); inside the pod `fi_info -p efa` should list the devices",
    ),
    (
        re.compile(r"NET/Plugin ?: (Could not find: libnccl-net\.so|No plugin found \(libnccl-net\.so\))"),
        "NCCL found no network plugin: the aws-ofi-nccl library (/opt/amazon/ofi-nccl/lib) is not on "
        "LD_LIBRARY_PATH; use the training image (containers/train/Dockerfile)",
    ),
    (
        re.compile(r"NET/OFI aws-ofi-nccl initialization failed"),
        "the aws-ofi-nccl plugin failed to initialise; the lines before it in the log say why",
    ),
)


@dataclass(frozen=True)
class NetCheck:
    network: str | None  # what NCCL said it uses, None when the log never said
    efa: bool
    cause: str | None  # why EFA was not used, when it was not

    @property
    def ok(self) -> bool:
        return self.efa


def check_init_log(text: str) -> NetCheck:
    """Whether NCCL's network was the libfabric plugin over EFA, and if not, the most specific cause found."""
    networks = NETWORK.findall(text)
    network = networks[-1] if networks else None
    efa = network in ("AWS Libfabric", "Libfabric", "OFI") and bool(EFA_PROVIDER.search(text))
    if efa:
        return NetCheck(network, True, None)
    for pattern, cause in CAUSES:
        if pattern.search(text):
            return NetCheck(network, False, cause)
    interfaces = SOCKET_IFS.findall(text)
    if network == "Socket" and interfaces and "pod-id-link" in interfaces[-1]:
        return NetCheck(
            network,
            False,
            f"NCCL fell back to TCP sockets and bound the EKS Pod Identity link ({interfaces[-1].strip()}): set "
            "NCCL_SOCKET_IFNAME=^lo,docker,veth,pod-id-link (the training image does) and request EFA",
        )
    if network == "Socket":
        return NetCheck(network, False, "NCCL fell back to TCP sockets (no EFA): the log shows no plugin error")
    if not text.strip():
        return NetCheck(None, False, "this rank wrote no NCCL init log (NCCL_DEBUG_FILE): NCCL never initialised there")
    if network is None:
        missing = "the log has no 'Using network' line: run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
        return NetCheck(None, False, missing)
    return NetCheck(network, False, f"NCCL used {network}, not the libfabric plugin over EFA")

#!/bin/sh
# greenboot health check of the edge runtime. Install as
#   /etc/greenboot/check/required.d/50-edge.sh   (mode 0755)
# The boot is good only when edge.service is ready, serves the package the new image ships,
# embeds that package's reference text as its build did, and booted within the package's
# budget (docs/selftest.md). A non-zero exit fails the required check: greenboot reboots, and
# once its boot counter runs out the previous deployment is booted again.
#
# `edge selftest` waits up to --timeout for the service to become ready, so this may run while
# it is still starting. It connects to ipc:///run/edge/edge.sock and reads the package of the
# installed bundle (/opt/edge/bundle/current/rootfs/opt/edge/package); EDGE_ADDRESS and
# EDGE_PACKAGE override them. Its lines go to the journal (journalctl -u greenboot-healthcheck).
set -eu
exec edge selftest --timeout 30

#!/usr/bin/env bash
# jobctl: the Secret quick-1-channel from which the pods of run quick-1 read
# JOBCTL_CHANNEL_SECRET (manifests.yaml names it in a secretKeyRef, never its value).
# The value is this shell's JOBCTL_CHANNEL_SECRET; it reaches kubectl through a pipe, never a
# file or a command line. `jobctl apply` runs this script before applying manifests.yaml.
set -euo pipefail
: "${JOBCTL_CHANNEL_SECRET:?must hold the channel secret of the run}"
printf '%s' "$JOBCTL_CHANNEL_SECRET" |
  kubectl create secret generic quick-1-channel --namespace=training \
    --from-file=secret=/dev/stdin --dry-run=client --output=yaml |
  kubectl label --local --filename=- --output=yaml app.kubernetes.io/managed-by=jobctl jobctl.dev/run=quick-1 |
  kubectl apply --filename=-

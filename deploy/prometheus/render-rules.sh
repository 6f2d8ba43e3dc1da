#!/bin/sh
# Renders sluice-rules.yaml (beside this script) with the address of the
# runbook, so every alert's runbook_url is a link Alertmanager and its
# receivers can open: the one place to set it.
#
#   sh deploy/prometheus/render-rules.sh RUNBOOK_URL > sluice-rules.yaml
#   sh deploy/prometheus/render-rules.sh RUNBOOK_URL --prometheus-rule NAMESPACE [NAME]
#
# RUNBOOK_URL: where docs/runbook.md is published (http:// or https://, no
# "#": each alert adds its section, #sluicedown and so on). With
# --prometheus-rule, the rules come wrapped in a PrometheusRule object (the
# Prometheus Operator's) in NAMESPACE, named NAME (default sluice), labelled
# app.kubernetes.io/name: sluice for a ruleSelector to pick.
set -eu
usage() {
    echo "usage: sh render-rules.sh RUNBOOK_URL [--prometheus-rule NAMESPACE [NAME]]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
URL=$1
shift
case $URL in
    http://?* | https://?*) ;;
    *) echo "render-rules.sh: RUNBOOK_URL must be an absolute http(s) URL, got '$URL'" >&2; exit 2 ;;
esac
case $URL in
    *'#'* | *'"'* | *'|'* | *' '*)
        echo "render-rules.sh: RUNBOOK_URL must not hold '#', '\"', '|' or spaces" >&2
        exit 2
        ;;
esac
WRAP="" NS="" NAME=sluice
if [ $# -gt 0 ]; then
    [ "$1" = --prometheus-rule ] && [ $# -ge 2 ] && [ $# -le 3 ] || usage
    WRAP=1 NS=$2 NAME=${3:-sluice}
fi
RULES=$(dirname "$0")/sluice-rules.yaml
# As sed's replacement: & and \ stand for themselves.
URL=$(printf '%s' "$URL" | sed 's/[&\\]/\\&/g')

if [ -z "$WRAP" ]; then
    sed "s|@RUNBOOK_URL@|$URL|g" "$RULES"
    exit 0
fi
cat <<HEAD
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: $NAME
  namespace: $NS
  labels:
    app.kubernetes.io/name: sluice
spec:
HEAD
# The groups, under spec:, without the file's leading comments.
sed -n '/^groups:/,$p' "$RULES" | sed "s|@RUNBOOK_URL@|$URL|g; s|^|  |; s|^  $||"

# compare: stderr
echo out
echo err >&2
echo out2

{ false; true; } && echo group-ok
( exit 4 ) || echo "subshell failed $?"

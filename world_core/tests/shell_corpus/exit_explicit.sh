echo before
exit 5
echo after

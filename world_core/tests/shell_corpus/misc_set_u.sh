set -u
( echo "$undefined_var" ) 2>/dev/null
echo "status $?"

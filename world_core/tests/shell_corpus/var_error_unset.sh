unset q
( : "${q:?q is required}" ) 2>/dev/null
echo "status $?"

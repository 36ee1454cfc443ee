set -- a b c d
shift
echo "$@"
shift 2
echo "$@"

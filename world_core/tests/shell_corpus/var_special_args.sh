set -- one two three
echo "$#" "$1" "$3"
echo "$@"

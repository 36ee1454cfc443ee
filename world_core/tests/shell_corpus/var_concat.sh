a=foo; b=bar
c="$a$b"
c+=baz
echo "$c"

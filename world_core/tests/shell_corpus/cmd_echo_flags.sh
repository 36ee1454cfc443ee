echo -n no-newline
echo
echo -e 'tab\there'
echo 'literal\tbackslash'

exec > out.txt
echo captured
echo also
exec >&2

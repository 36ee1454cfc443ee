s="hello world"
echo "${#s}"

s="foofoo"
echo "${s/#foo/bar}" "${s/%foo/bar}"

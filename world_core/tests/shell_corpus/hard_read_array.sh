read -ra parts <<< "x y  z"
echo "${#parts[@]} ${parts[2]}"

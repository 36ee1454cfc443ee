z=set
echo "${z:+alt}" "[${unset_var:+alt}]"

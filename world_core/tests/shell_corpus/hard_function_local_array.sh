f() { local -a xs=("$@"); echo "${#xs[@]}:${xs[-1]}"; }
f a b c

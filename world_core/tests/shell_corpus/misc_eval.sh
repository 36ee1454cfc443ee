cmd='echo evaluated'
eval "$cmd"

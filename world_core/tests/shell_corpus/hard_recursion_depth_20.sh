countdown() {
  if [ "$1" -le 0 ]; then echo liftoff; return; fi
  countdown $(( $1 - 1 ))
}
countdown 20

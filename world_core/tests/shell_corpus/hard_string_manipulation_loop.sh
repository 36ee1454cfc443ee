for w in Alpha beta GAMMA; do
  lower=${w,,}
  echo "${lower^}:${#w}"
done

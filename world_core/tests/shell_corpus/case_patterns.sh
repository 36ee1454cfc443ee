for v in yes Y no n maybe; do
  case "$v" in
    [Yy]*) echo "$v -> yes" ;;
    [Nn]*) echo "$v -> no" ;;
    *) echo "$v -> ?" ;;
  esac
done

case x in
  x) echo first ;&
  y) echo second ;;
  z) echo third ;;
esac
